-- The dead-letter list pages in (failed_at, outbox_id) order. Only the
-- unacknowledged rows had an index in that order (001), so a page of the
-- list with acknowledged ones included (`outbox dlq list --all`, the
-- console's "all" view) sorted the whole table: 41 ms a page at 200,000
-- rows, growing with every dead letter ever acknowledged, which stay. The
-- index makes a page read its rows and no more. Dead letters are rare
-- writes, so the hot path pays nothing for it; building it holds off
-- outcome writes for as long as it takes (about 0.1 s per 200,000 rows).
CREATE INDEX dead_letters_failed_idx ON {{.schema}}.dead_letters (failed_at, outbox_id);

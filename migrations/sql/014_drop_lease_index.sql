-- inflight_lease_idx (001) served only the reaper, which looks for expired
-- leases once a pass (every minute by default), while every claim paid for
-- an entry in it and the table's vacuum for removing it. inflight holds
-- what is in flight, a few hundred rows per relayer, so a pass reads the
-- table itself instead (the reaper still reads nothing but inflight).
-- Dropping it made the 100,000-instruction drain about 4% faster, ordered
-- and unordered (`outbox bench drain`, docs/architecture.md).
DROP INDEX {{.schema}}.inflight_lease_idx;

-- Poison instructions: an instruction whose dispatch kills its relayer
-- comes back through the reaper after every death, and with ordering on
-- blocks its participant for good. zombie_count counts the reaper's
-- requeues of an instruction; the reaper dead-letters it instead once the
-- count reaches its limit (reaper.Config.ZombieLimit, default 3). Such a
-- dead letter is marked outcome_unknown: the rail may or may not have
-- acted on the last attempt, and a replay reuses the same idempotency key.
-- Constant defaults: no table rewrite.
ALTER TABLE {{.schema}}.pending ADD COLUMN zombie_count int NOT NULL DEFAULT 0;
ALTER TABLE {{.schema}}.inflight ADD COLUMN zombie_count int NOT NULL DEFAULT 0;
ALTER TABLE {{.schema}}.dead_letters ADD COLUMN outcome_unknown boolean NOT NULL DEFAULT false;

-- Suspects: instructions the reaper requeued twice (once is what a killed
-- relayer does to everything it held; those go back at full speed). A relayer
-- dispatches a suspect alone (nothing else of its own in flight), so that a
-- poison instruction's next death makes only itself a zombie again, not
-- whatever happened to be in flight beside it. The plain claim skips
-- suspects; this index, empty but for them, finds them.
CREATE INDEX pending_suspects_idx ON {{.schema}}.pending (next_attempt_at, created_at) WHERE zombie_count >= 2;

-- The reconciler's sweep for attempts left `started` by a driver that
-- stopped (a crash during a loser's grace period, a lost database write).
CREATE INDEX attempts_started ON attempts (started_at) WHERE state = 'started';

-- A resumed run (a Temporal reset) writes a second trace under the same workflow id. The older
-- run's trace stays for audit but is marked superseded, and GRPO groups skip it.
ALTER TABLE traces ADD COLUMN superseded boolean NOT NULL DEFAULT false;
UPDATE traces t SET superseded = true
WHERE EXISTS (SELECT 1 FROM traces n WHERE n.workflow_id = t.workflow_id
              AND n.finished_at > t.finished_at);
DROP INDEX traces_groups;
CREATE INDEX traces_groups ON traces (policy_name, policy_version, task_id, finished_at)
    WHERE depth = 0 AND NOT superseded;

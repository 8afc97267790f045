-- The batch a run belonged to (conductor batch), for batch reports and per-batch analysis.
ALTER TABLE traces ADD COLUMN batch text;
UPDATE traces SET batch = trace->'task'->>'batch' WHERE trace->'task'->>'batch' IS NOT NULL;
CREATE INDEX traces_batch ON traces (batch, workflow_id, finished_at) WHERE batch IS NOT NULL;

-- One row per run (workflow id + run id). The whole trace is the jsonb document; the columns
-- beside it are what the trainer and analysts filter on, so they get indexes.
CREATE TABLE traces (
    workflow_id        text             NOT NULL,
    run_id             text             NOT NULL,
    parent_workflow_id text,
    depth              integer          NOT NULL DEFAULT 0,
    task_id            text             NOT NULL,
    dataset            text,
    tags               text[]           NOT NULL DEFAULT '{}',
    policy_name        text             NOT NULL,
    policy_version     text             NOT NULL,
    status             text             NOT NULL,
    reward             double precision,
    correct            boolean,
    verifier           text,
    input_tokens       bigint           NOT NULL DEFAULT 0,
    output_tokens      bigint           NOT NULL DEFAULT 0,
    cost_usd           double precision NOT NULL DEFAULT 0,
    seconds            double precision NOT NULL DEFAULT 0,
    started_at         timestamptz      NOT NULL,
    finished_at        timestamptz      NOT NULL,
    recorded_at        timestamptz      NOT NULL DEFAULT now(),
    schema_version     integer          NOT NULL,
    trace              jsonb            NOT NULL,
    PRIMARY KEY (workflow_id, run_id)
);

-- GRPO groups: root runs of one task under one policy version, oldest first.
CREATE INDEX traces_groups ON traces (policy_name, policy_version, task_id, finished_at)
    WHERE depth = 0;
CREATE INDEX traces_dataset ON traces (dataset, finished_at);
CREATE INDEX traces_finished ON traces (finished_at);
CREATE INDEX traces_reward ON traces (reward);
CREATE INDEX traces_tags ON traces USING gin (tags);
CREATE INDEX traces_parent ON traces (parent_workflow_id) WHERE parent_workflow_id IS NOT NULL;

-- The policy registry: one row per published version of a trainable conductor. Version 0 is
-- the base model and has no row. `files` maps each checkpoint file name to its blob reference.
CREATE TABLE policies (
    name        text        NOT NULL,
    version     integer     NOT NULL CHECK (version > 0),
    parent      integer     NOT NULL CHECK (parent >= 0 AND parent < version),
    base_model  text        NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('lora', 'full')),
    files       jsonb       NOT NULL,
    optimizer   text,
    metrics     jsonb       NOT NULL DEFAULT '{}',
    update_id   text        NOT NULL UNIQUE,
    created     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

-- Which update trained on a trace. Set in the same transaction that registers the version the
-- update produced, so a trace is consumed once, by an update that was published.
ALTER TABLE traces ADD COLUMN consumed_by text;
CREATE INDEX traces_consumed_by ON traces (consumed_by) WHERE consumed_by IS NOT NULL;

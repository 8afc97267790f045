-- Retention (engine/storage/retention.py): which versions' files were removed from the blob
-- store, which versions are pinned (never pruned), and when a plan last used each version (a
-- version in use is not pruned). A pruned version keeps its row and its references: history
-- and metrics stay, and loading it says it was pruned rather than failing on a missing blob.
ALTER TABLE policies
    ADD COLUMN pinned           boolean     NOT NULL DEFAULT false,
    ADD COLUMN served_at        timestamptz,
    ADD COLUMN files_pruned     timestamptz,
    ADD COLUMN optimizer_pruned timestamptz;

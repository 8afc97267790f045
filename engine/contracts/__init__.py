"""What two layers share: activity and workflow names, ids, request and result models, and the
torch-free training recipe that both the orchestration and the trainer read."""

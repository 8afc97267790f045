"""What two layers share: activity and workflow names, ids, request and result models, batch and
training-run inputs and progress, agent specs, the policy version, and the torch-free training
recipe that both the orchestration and the trainer read."""

"""ultimat3-jobs: durable background jobs with transactional enqueue."""

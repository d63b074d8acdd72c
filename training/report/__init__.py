"""What a job reports: timers, epoch records, memory, TensorBoard."""

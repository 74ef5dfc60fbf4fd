"""The engine loop, scheduler, block manager, sequences, sampling and the model runner."""

"""accumrun: a TensorFlow training runner with exact darknet-style gradient accumulation."""

__version__ = "0.1.0"

"""The dataflow engine: stage pools with micro-batching, and the driver loop over item state machines."""

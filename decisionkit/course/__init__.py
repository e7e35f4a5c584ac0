"""The course's labs: probes, zero-shot and generative baselines, latency, memory, numerics, ONNX, the serving lab, widgets and the hood."""

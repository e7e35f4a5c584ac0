"""Training, calibrating and measuring a model: presets, the training call, calibration, anomaly routing, runs and reports."""

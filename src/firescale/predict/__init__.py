"""The model applied to a sweep: per-point predictions, calibration from measurements, and their validation."""

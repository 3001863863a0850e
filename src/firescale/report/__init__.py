"""The reproducibility report: run records in, FireCaffe-style tables, plots and provenance out."""

"""Job scripts and their life: the JobSpec, rendering, schedulers, watching, outcomes and run locks."""

"""The sweep stage: experiments, their points, one SweepPlan, job scripts, and running and recording each point."""

"""The sweep stage: experiments, their points, one Plan, job scripts, and running and recording each point."""

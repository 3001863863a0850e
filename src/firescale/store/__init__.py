"""The results store: every sweep's runs, kept across sweeps, sites and versions, and compared."""

"""Jobs from the command line: checks before Hydra writes anything, the sweeper, the launcher."""

"""What a run leaves behind: checkpoints (whole or sharded) and their ``state.json``, a run's saves
as the loop takes them, the code that made them, soups and exports."""

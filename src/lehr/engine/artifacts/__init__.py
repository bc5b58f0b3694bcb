"""What a run leaves behind: checkpoints (whole or sharded), the code that made them, soups and exports."""

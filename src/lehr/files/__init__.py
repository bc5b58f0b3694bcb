"""Files that survive kills: atomic writes and folder swaps, one-writer locks, and the rule for a
name that becomes a folder."""

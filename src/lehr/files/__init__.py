"""Files that survive kills: atomic writes and folder swaps, one-writer locks, and the rolling
run folders an operator lists and prunes."""

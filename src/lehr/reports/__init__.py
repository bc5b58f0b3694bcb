"""What lehr reports and decides from what it trained: the stages' metrics and curves, paired
comparisons of two models, the ladder's scaling-law fit and its predictions, lm-evaluation-harness
scores, the recipe's ledger, and what a checkpoint records of how it was made."""

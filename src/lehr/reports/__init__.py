"""What lehr reports and decides from what it trained: the stages' metrics and curves, paired
comparisons of two models, the ladder's scaling-law fit and lm-evaluation-harness scores."""

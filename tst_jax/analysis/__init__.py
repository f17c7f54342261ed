"""Corpus analyses behind the TST recipe: token mutual information and fitted bag weights."""

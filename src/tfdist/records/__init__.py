"""What the stages hand each other, typed and read strictly: the reports, the per-epoch history, what each measured
field is, and the names and paths of runs."""

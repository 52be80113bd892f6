"""params.yaml as typed, frozen records: the knobs and what each decides (knobs), and the strict loading of the file
and its overrides (params)."""

"""What tests share besides fixtures, by concern; tests/ is on sys.path (pyproject: pythonpath)."""

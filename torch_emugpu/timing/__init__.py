"""Where a model's time comes from when it was measured: profiles on the
search path and their lookup (profiles.py), and the region planner that
charges a matching model its profiled times (planner.py)."""

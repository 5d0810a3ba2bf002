"""The kernel's warm-up: its settings, its plan, the scheduler that runs it and a recipe per framework."""

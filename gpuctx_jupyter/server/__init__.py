"""The jupyter_server side: settings, the GPU API, the kernel start/restart hook, the warm pool,
one action per kernel at a time (actions.py), kernel queries, attribution and metrics. Never
imports the kernel side."""

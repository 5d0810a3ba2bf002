"""The jupyter_server side, assembled by extension.py: settings, launching kernels (the launcher,
the provisioner, the warm pool), the lifecycle chain, who holds the GPU, the GPU API and metrics.
Never imports the kernel side."""

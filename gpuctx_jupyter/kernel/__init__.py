"""The kernel side: the IPython extension, magics, warm-up, device switching, the monitor widget
and the kernel's answer to the server's GPU question. Never imports the server side."""

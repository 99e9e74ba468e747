"""The ``gpuquota`` command line (also ``kubectl gpuquota``): thin click commands over the core."""

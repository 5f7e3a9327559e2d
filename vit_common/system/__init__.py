"""File safety and host limits, framework-free: the one module that writes files (``io``), the one
validation layer for values that enter from flags, configs and files (``validate``), and the process-wide
malloc settings (``host_memory``) and CPU devices (``host_devices``). Read ``io`` first."""

"""Device runtimes, one package per device: `<device>/runtime.py`'s `create_device()` makes its
`tgrad.device.Compiled`."""

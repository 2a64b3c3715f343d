"""Device runtimes, one file per device: each module's `create_device()` returns a `tgrad.device.Compiled`."""

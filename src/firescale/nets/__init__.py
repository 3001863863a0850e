"""Networks: the framework-neutral NetSpec, the built-in zoo and layer-to-device plans."""

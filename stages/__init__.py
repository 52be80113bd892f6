"""DVC stage entry points: thin click commands over :mod:`tfdist.pipeline`."""

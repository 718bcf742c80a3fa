"""k3env smoke: start the profile's processes in the image on a CPU and send them real requests."""

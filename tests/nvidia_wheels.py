"""Where this Python's NVIDIA wheels (nvidia-cublas, nvidia-cudnn-cu13, nvidia-nccl-cu13) put their
libraries: the CUDA variant tests skip, with the reason, when one is missing."""
import glob
import os
import site
import sysconfig


def site_dirs():
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # some virtualenvs lack it
        pass
    return sorted(dirs)


def wheel_lib(pattern):
    """The first <site-packages>/nvidia/*/lib/<pattern>, or None."""
    for d in site_dirs():
        hits = glob.glob(os.path.join(d, "nvidia", "*", "lib", pattern))
        if hits:
            return hits[0]
    return None

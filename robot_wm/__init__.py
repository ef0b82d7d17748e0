"""robot_wm: a ROS 2 stack that carries a sim-trained arm policy onto hardware through a world model.

The generated message modules (``robot_wm.msg``) are built by rosidl into the install space
(the venv's site-packages, or a colcon install/ tree), while the Python code may be imported from
this source tree (editable install, pytest). ``extend_path`` merges every ``robot_wm`` directory
on ``sys.path`` into one package so ``robot_wm.msg`` resolves whichever copy of the code runs.
"""
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
__version__ = "0.1.0"

"""Python packaging of robot_wm for the pip path (no ROS install).

On a ROS 2 install the package is built by colcon through CMakeLists.txt (ament_cmake: it must
generate msg/ and srv/), which installs the same Python package and the scripts in scripts/ to
lib/robot_wm for `ros2 run`. Here pip installs the code, the `robot-wm` command, and the data
files under <prefix>/share/robot_wm.
"""
from glob import glob
from pathlib import Path

from setuptools import find_packages, setup

package_name = "robot_wm"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*", "bench", "tools"]),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/robot_wm"]),
        (f"share/{package_name}", ["package.xml"]),
        (f"share/{package_name}/launch", glob("launch/*.py")),
        (f"share/{package_name}/config", glob("config/*.yaml") + glob("config/*.xml")),
        (f"share/{package_name}/config/sim_profiles", glob("config/sim_profiles/*.yaml")),
        (f"share/{package_name}/urdf", glob("urdf/*.xacro")),
    ] + [  # models/ (reach) and every model set below it (models/track/, models/<task>_sim_only/)
        (f"share/{package_name}/{d}", glob(f"{d}/*.onnx") + glob(f"{d}/*.json"))
        for d in ["models"] + sorted(str(Path(p).parent) for p in glob("models/*/policy.onnx"))
    ] + [(f"share/{package_name}/{d}", glob(f"{d}/*.json")) for d in ("models/trust", "models/trust/track")],
    install_requires=["numpy", "PyYAML", "xacro", "pin", "mujoco", "osqp", "onnxruntime"],
    python_requires=">=3.10",
    zip_safe=False,
    maintainer="robot_wm maintainers",
    maintainer_email="robot_wm@example.com",
    description="World-model-bridged sim-to-real control of a robot arm on ROS 2",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "robot-wm = robot_wm.cli:main",
        ],
    },
)

# Fix-ups for ROS 2 packages installed from the PyPI wheels (ros-* wheels).
#
# The wheels' exported CMake targets carry absolute paths from the machine that built them:
#   /opt/python/cp311-cp311/include/python3.11                           (Python headers)
#   /opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include (NumPy headers)
#   /usr/lib64/libtinyxml2.so                                            (Fast DDS link entry)
# CMake refuses imported targets whose include directories do not exist, and a link entry that
# names a missing file breaks the link step. robot_wm_fix_pip_wheel_targets() rewrites such
# entries on every imported target of the calling directory:
#   - a missing .../include/python3.X      -> this interpreter's Python3_INCLUDE_DIRS
#   - a missing .../numpy/(_)core/include  -> this interpreter's numpy.get_include()
#   - a missing .../libtinyxml2.*          -> dropped (Fast DDS from the wheels carries its own)
# Only entries that are absolute paths which do NOT exist are touched, so on a real ROS install
# (or once the wheels are fixed) this is a no-op.
#
# robot_wm_fix_exported_include_dirs(<target>...) handles a second pip-venv quirk: when the venv
# lives inside the source tree (/work/main/.venv), the NumPy include dir that rosidl_generator_py
# puts on the exported <pkg>__rosidl_generator_py target is "prefixed in the source directory",
# which CMake refuses for an installed export. Such entries are wrapped in $<BUILD_INTERFACE:...>
# (paths outside the source/build trees, i.e. every real install, are left alone).
#
# Call both after rosidl_generate_interfaces() (which imports/creates the targets involved).

function(_robot_wm_fix_list in_list out_var changed_var)
  set(_result "")
  set(_changed FALSE)
  foreach(_item IN LISTS in_list)
    if(IS_ABSOLUTE "${_item}" AND NOT EXISTS "${_item}")
      if(_item MATCHES "/numpy/_?core/include/?$")
        list(APPEND _result ${Python3_NumPy_INCLUDE_DIRS})
        set(_changed TRUE)
        continue()
      elseif(_item MATCHES "/include/python3\\.[0-9]+/?$")
        list(APPEND _result ${Python3_INCLUDE_DIRS})
        set(_changed TRUE)
        continue()
      elseif(_item MATCHES "/libtinyxml2[^/]*$")
        set(_changed TRUE)
        continue()
      endif()
    endif()
    list(APPEND _result "${_item}")
  endforeach()
  if(_changed)
    list(REMOVE_DUPLICATES _result)
  endif()
  set(${out_var} "${_result}" PARENT_SCOPE)
  set(${changed_var} ${_changed} PARENT_SCOPE)
endfunction()

function(robot_wm_fix_pip_wheel_targets)
  get_property(_targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  set(_properties
    INTERFACE_INCLUDE_DIRECTORIES
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES
    INTERFACE_LINK_LIBRARIES
    INTERFACE_LINK_DIRECTORIES)
  set(_need_python TRUE)
  set(_fixed "")
  foreach(_target IN LISTS _targets)
    foreach(_prop IN LISTS _properties)
      get_target_property(_value ${_target} ${_prop})
      if(NOT _value)
        continue()
      endif()
      # Cheap pre-check: only look closer when a suspicious path is present.
      if(NOT _value MATCHES "include/python3|numpy/_?core/include|libtinyxml2")
        continue()
      endif()
      if(_need_python AND (NOT Python3_INCLUDE_DIRS OR NOT Python3_NumPy_INCLUDE_DIRS))
        find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module NumPy)
      endif()
      set(_need_python FALSE)
      _robot_wm_fix_list("${_value}" _new _changed)
      if(_changed)
        set_property(TARGET ${_target} PROPERTY ${_prop} "${_new}")
        list(APPEND _fixed "${_target}:${_prop}")
      endif()
    endforeach()
  endforeach()
  if(_fixed)
    list(LENGTH _fixed _n)
    list(JOIN _fixed "\n    " _pretty)
    message(STATUS "robot_wm: rewrote ${_n} pip-wheel target properties "
      "(Python include: ${Python3_INCLUDE_DIRS}; NumPy include: ${Python3_NumPy_INCLUDE_DIRS}):\n    ${_pretty}")
  endif()
endfunction()

function(robot_wm_fix_exported_include_dirs)
  foreach(_target IN LISTS ARGN)
    if(NOT TARGET ${_target})
      continue()
    endif()
    get_target_property(_value ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT _value)
      continue()
    endif()
    set(_result "")
    set(_changed FALSE)
    foreach(_item IN LISTS _value)
      set(_in_tree FALSE)
      if(IS_ABSOLUTE "${_item}")
        cmake_path(IS_PREFIX CMAKE_SOURCE_DIR "${_item}" NORMALIZE _in_src)
        cmake_path(IS_PREFIX CMAKE_BINARY_DIR "${_item}" NORMALIZE _in_bin)
        if(_in_src OR _in_bin)
          set(_in_tree TRUE)
        endif()
      endif()
      if(_in_tree)
        list(APPEND _result "$<BUILD_INTERFACE:${_item}>")
        set(_changed TRUE)
      else()
        list(APPEND _result "${_item}")
      endif()
    endforeach()
    if(_changed)
      set_property(TARGET ${_target} PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_result}")
      message(STATUS "robot_wm: ${_target}: include dirs inside the source/build tree "
        "made build-only (venv inside the source tree)")
    endif()
  endforeach()
endfunction()

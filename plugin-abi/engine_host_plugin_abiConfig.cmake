include(${CMAKE_CURRENT_LIST_DIR}/engine_host_plugin_abiTargets.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/EngineHostPlugin.cmake)

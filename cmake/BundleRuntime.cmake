# Copies the non-system shared libraries that engine-host and the plugins use
# (spdlog, fmt, simdjson, cpp-httplib, ...) into <build>/lib, where the
# $ORIGIN/../lib RPATH finds them. A carried build tree then runs on a
# machine that lacks the Debian -dev packages (the GPU machine).
set(_eh_bundle_targets)
foreach(t engine-host)
  if(TARGET ${t})
    list(APPEND _eh_bundle_targets ${t})
  endif()
endforeach()
if(_eh_bundle_targets)
  set(_files)
  foreach(t IN LISTS _eh_bundle_targets)
    list(APPEND _files $<TARGET_FILE:${t}>)
  endforeach()
  add_custom_target(eh_bundle_runtime ALL
    COMMAND ${CMAKE_COMMAND} -DDEST=${CMAKE_BINARY_DIR}/lib "-DFILES=${_files}"
            -P ${CMAKE_CURRENT_LIST_DIR}/eh_bundle_runtime.cmake
    DEPENDS ${_eh_bundle_targets}
    COMMAND_EXPAND_LISTS
    COMMENT "Bundling runtime libraries into lib/")
endif()

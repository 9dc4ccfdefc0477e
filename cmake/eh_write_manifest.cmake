# Writes a plugin manifest (script mode; called by engine_host_add_plugin).
# Inputs: LIBRARY ABI_HEADER MANIFEST NAME VERSION ENGINE PLATFORM DEVICE MIN_CC PRIORITY
#         FORMATS ARCHITECTURES QUANT_KINDS (comma-separated lists)
file(SHA256 "${LIBRARY}" sha)
get_filename_component(libname "${LIBRARY}" NAME)
file(STRINGS "${ABI_HEADER}" _major REGEX "^#define EH_ABI_MAJOR [0-9]+")
file(STRINGS "${ABI_HEADER}" _minor REGEX "^#define EH_ABI_MINOR [0-9]+")
string(REGEX REPLACE ".* " "" abi_major "${_major}")
string(REGEX REPLACE ".* " "" abi_minor "${_minor}")

function(json_list out csv)
  string(REPLACE "," "\", \"" body "${csv}")
  set(${out} "[\"${body}\"]" PARENT_SCOPE)
endfunction()
json_list(formats "${FORMATS}")
json_list(archs "${ARCHITECTURES}")
json_list(quants "${QUANT_KINDS}")

file(WRITE "${MANIFEST}" "{
  \"manifest_version\": 1,
  \"name\": \"${NAME}\",
  \"version\": \"${VERSION}\",
  \"engine\": \"${ENGINE}\",
  \"abi\": {\"major\": ${abi_major}, \"minor\": ${abi_minor}},
  \"library\": \"${libname}\",
  \"sha256\": \"${sha}\",
  \"platform\": \"${PLATFORM}\",
  \"formats\": ${formats},
  \"architectures\": ${archs},
  \"quant_kinds\": ${quants},
  \"device\": {\"kind\": \"${DEVICE}\", \"min_compute_capability\": ${MIN_CC}},
  \"priority\": ${PRIORITY}
}
")

# Helpers shared by every target.

# ISA-specific kernel sources get their flags per file. Such a file must not define or
# instantiate inline functions that other translation units also use (std:: templates included),
# or the linker may keep the AVX-512 copy for everyone; keep those files to intrinsics over
# plain arrays inside an anonymous or ISA-named namespace.
set(DEEPINFER_AVX2_FLAGS -mavx2 -mfma -mf16c)
set(DEEPINFER_AVX512_FLAGS -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq
    -mavx512bf16)

function(deepinfer_isa_sources isa)
  if(isa STREQUAL "AVX2")
    set(flags ${DEEPINFER_AVX2_FLAGS})
  elseif(isa STREQUAL "AVX512")
    set(flags ${DEEPINFER_AVX512_FLAGS})
  else()
    message(FATAL_ERROR "unknown ISA ${isa}")
  endif()
  set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "${flags}")
endfunction()

# deepinfer_library(name SOURCES ... DEPS ...): one library per src/ folder.
function(deepinfer_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
endfunction()

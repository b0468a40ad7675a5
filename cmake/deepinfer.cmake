# Helpers shared by every target.

# ISA-specific kernel sources get their flags per file (or per object library for *_vec.cpp).
# Such a file must not define or instantiate inline functions that other translation units also
# use (std:: templates included), or the linker may keep the AVX-512 copy for everyone; keep
# those files to intrinsics over plain arrays inside an anonymous or ISA-named namespace.
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

# deepinfer_folder_library(name DEPS ... PRIVATE_DEPS ...): a library made of every .cpp in the
# calling folder. Files named *_avx2.cpp / *_avx512.cpp get that ISA's flags; files named
# *_vec.cpp are compiled twice, once per ISA (see kernels/simd.h).
function(deepinfer_folder_library name)
  cmake_parse_arguments(ARG "" "" "DEPS;PRIVATE_DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  file(GLOB vec_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_vec.cpp)
  if(vec_srcs)
    list(REMOVE_ITEM srcs ${vec_srcs})
    foreach(isa AVX2 AVX512)
      add_library(${name}_${isa} OBJECT ${vec_srcs})
      target_compile_options(${name}_${isa} PRIVATE ${DEEPINFER_${isa}_FLAGS})
      target_link_libraries(${name}_${isa} PRIVATE ${ARG_DEPS})
      target_include_directories(${name}_${isa} PRIVATE ${PROJECT_SOURCE_DIR}/src)
      list(APPEND srcs $<TARGET_OBJECTS:${name}_${isa}>)
    endforeach()
  endif()
  foreach(f ${srcs})
    if(f MATCHES "_avx512\\.cpp$")
      deepinfer_isa_sources(AVX512 ${f})
    elseif(f MATCHES "_avx2\\.cpp$")
      deepinfer_isa_sources(AVX2 ${f})
    endif()
  endforeach()
  if(NOT srcs)  # a folder with headers only (so far)
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
    return()
  endif()
  deepinfer_library(${name} SOURCES ${srcs} DEPS ${ARG_DEPS} PRIVATE_DEPS ${ARG_PRIVATE_DEPS})
endfunction()

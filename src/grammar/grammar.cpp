#include "grammar/grammar.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace deepinfer::grammar {

// --- vocabulary ---

TokenVocab::TokenVocab(std::vector<std::string> bytes, int32_t eos)
    : bytes_(std::move(bytes)), eos_(eos) {
  DI_REQUIRE(eos_ >= 0 && eos_ < int32_t(bytes_.size()), "grammar vocabulary: EOS id ", eos_,
             " is outside [0, ", bytes_.size(), ")");
  std::vector<int32_t>& ids = sorted_ids_;
  for (int32_t i = 0; i < int32_t(bytes_.size()); ++i)
    if (!bytes_[size_t(i)].empty() && i != eos_) ids.push_back(i);
  std::sort(ids.begin(), ids.end(), [this](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });
  // Sorted strings make a trie in preorder by extending the previous string's path: `path[d]`
  // is the node at depth d. A node's subtree ends where the next node of its depth or less
  // begins.
  nodes_.assign(1, Node{});
  std::vector<uint32_t> path{0};
  std::string_view prev;
  for (uint32_t k = 0; k < ids.size(); ++k) {
    const std::string_view s = bytes_[size_t(ids[k])];
    DI_REQUIRE(s.size() < 65535, "grammar vocabulary: token ", ids[k], " is too long");
    const size_t common =
        size_t(std::mismatch(s.begin(), s.end(), prev.begin(), prev.end()).first - s.begin());
    for (size_t d = path.size() - 1; d > common; --d) nodes_[path[d]].end = uint32_t(nodes_.size());
    path.resize(common + 1);
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(uint32_t(nodes_.size()));
      nodes_.push_back(Node{0, 0, 0, uint16_t(d + 1), uint8_t(s[d])});
    }
    max_depth_ = std::max(max_depth_, s.size());
    Node& end = nodes_[path.back()];
    if (end.ids_end == 0) end.ids_begin = k;
    end.ids_end = k + 1;
    prev = s;
  }
  for (uint32_t n : path) nodes_[n].end = uint32_t(nodes_.size());
}

// --- expressions ---

struct ExprNode {
  // The empty string is a kSeq of no parts, and no string at all a kAlt of no options.
  enum Kind : uint8_t { kBytes, kSeq, kAlt, kList, kMembers, kUntil };
  Kind kind = kSeq;
  std::vector<std::pair<uint8_t, uint8_t>> ranges = {};  // kBytes
  std::vector<Expr> parts = {};                          // kSeq, kAlt; kList: {item, sep}
  std::vector<bool> required = {};                       // kMembers: parts[i] (sep is last)
  int32_t min = 0, max = 0;                              // kList
  std::string text = {};                                 // kUntil
};

namespace {
Expr node(ExprNode n) {
  return std::make_shared<const ExprNode>(std::move(n));
}
bool is_nothing(const Expr& e) {
  return e->kind == ExprNode::kAlt && e->parts.empty();
}
}  // namespace

Expr empty() {
  return node({.kind = ExprNode::kSeq});
}
Expr nothing() {
  return node({.kind = ExprNode::kAlt});
}
// The constructors fold away what can never match (a part or a required member that admits no
// string makes the whole admit none; such an option or optional member is dropped), so that a
// grammar never offers a way in that leads nowhere.
Expr byte_ranges(std::vector<std::pair<uint8_t, uint8_t>> ranges) {
  if (ranges.empty()) return nothing();
  return node({.kind = ExprNode::kBytes, .ranges = std::move(ranges)});
}
Expr lit(std::string_view bytes) {
  std::vector<Expr> parts;
  for (char c : bytes) parts.push_back(byte_ranges({{uint8_t(c), uint8_t(c)}}));
  return seq(std::move(parts));
}
Expr seq(std::vector<Expr> parts) {
  if (std::any_of(parts.begin(), parts.end(), is_nothing)) return nothing();
  return parts.size() == 1 ? parts[0] : node({.kind = ExprNode::kSeq, .parts = std::move(parts)});
}
Expr alt(std::vector<Expr> options) {
  std::erase_if(options, is_nothing);
  return options.size() == 1 ? options[0]
                             : node({.kind = ExprNode::kAlt, .parts = std::move(options)});
}
// A repetition is a list with an empty separator.
Expr repeat(Expr e, int32_t min, int32_t max) {
  return list(std::move(e), empty(), min, max);
}
Expr list(Expr item, Expr sep, int32_t min, int32_t max) {
  DI_REQUIRE(min >= 0 && (max < 0 || max >= min), "list or repeat: bad bounds ", min, "..", max);
  if (is_nothing(item)) return min == 0 ? empty() : nothing();
  if (is_nothing(sep)) {  // at most one item
    if (min > 1) return nothing();
    sep = empty();
    max = max == 0 ? 0 : 1;
  }
  return node({.kind = ExprNode::kList,
               .parts = {std::move(item), std::move(sep)},
               .min = min,
               .max = max});
}
Expr members(std::vector<Member> ms, Expr sep) {
  ExprNode n{.kind = ExprNode::kMembers};
  for (Member& m : ms) {
    if (is_nothing(m.expr)) {
      if (m.required) return nothing();
      continue;
    }
    n.parts.push_back(std::move(m.expr));
    n.required.push_back(m.required);
  }
  if (is_nothing(sep)) {  // at most one member: the required one, else any one or none
    const auto req = std::find(n.required.begin(), n.required.end(), true);
    if (req == n.required.end()) {
      n.parts.push_back(empty());
      return alt(std::move(n.parts));
    }
    if (std::count(req, n.required.end(), true) > 1) return nothing();
    return n.parts[size_t(req - n.required.begin())];
  }
  n.parts.push_back(std::move(sep));
  return node(std::move(n));
}
Expr until(std::string terminator) {
  DI_REQUIRE(!terminator.empty(), "until: empty terminator");
  return node({.kind = ExprNode::kUntil, .text = std::move(terminator)});
}

Expr utf8_char(std::string_view excluded_ascii) {
  // ASCII minus the excluded bytes, as ranges.
  std::vector<std::pair<uint8_t, uint8_t>> ascii;
  for (int c = 0; c < 0x80; ++c) {
    if (excluded_ascii.find(char(c)) != std::string_view::npos) continue;
    if (!ascii.empty() && ascii.back().second == c - 1)
      ascii.back().second = uint8_t(c);
    else
      ascii.push_back({uint8_t(c), uint8_t(c)});
  }
  const Expr cont = byte_ranges({{0x80, 0xbf}});
  return alt({
      byte_ranges(std::move(ascii)),
      seq({byte_ranges({{0xc2, 0xdf}}), cont}),
      seq({byte_ranges({{0xe0, 0xe0}}), byte_ranges({{0xa0, 0xbf}}), cont}),
      seq({byte_ranges({{0xe1, 0xec}, {0xee, 0xef}}), cont, cont}),
      seq({byte_ranges({{0xed, 0xed}}), byte_ranges({{0x80, 0x9f}}), cont}),
      seq({byte_ranges({{0xf0, 0xf0}}), byte_ranges({{0x90, 0xbf}}), cont, cont}),
      seq({byte_ranges({{0xf1, 0xf3}}), cont, cont, cont}),
      seq({byte_ranges({{0xf4, 0xf4}}), byte_ranges({{0x80, 0x8f}}), cont, cont}),
  });
}

// --- compilation: Thompson NFA with epsilon moves ---

namespace {

void set_bit(std::vector<uint64_t>& bits, int32_t id) {
  bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
}
bool none_set(const std::vector<uint64_t>& bits) {
  return std::all_of(bits.begin(), bits.end(), [](uint64_t w) { return w == 0; });
}

struct Edge {
  uint8_t lo, hi;
  uint32_t to;
};

// The NFA: per state, byte edges and epsilon moves.
struct Nfa {
  std::vector<std::vector<Edge>> edges;
  std::vector<std::vector<uint32_t>> eps;
  size_t max_states = 0;

  uint32_t state() {
    DI_REQUIRE(edges.size() < max_states, "the grammar needs more than ", max_states,
               " automaton states (a schema too large, or bounds too wide)");
    edges.emplace_back();
    eps.emplace_back();
    return uint32_t(edges.size() - 1);
  }
  void epsilon(uint32_t a, uint32_t b) { eps[a].push_back(b); }

  // Appends `e` after state `from`; returns the state where it ends.
  uint32_t emit(const ExprNode& e, uint32_t from) {
    switch (e.kind) {
      case ExprNode::kBytes: {
        const uint32_t to = state();
        for (const auto& [lo, hi] : e.ranges) edges[from].push_back({lo, hi, to});
        return to;
      }
      case ExprNode::kSeq: {
        uint32_t cur = from;
        for (const Expr& p : e.parts) cur = emit(*p, cur);
        return cur;
      }
      case ExprNode::kAlt: {
        const uint32_t end = state();  // unreachable when there are no options
        for (const Expr& p : e.parts) {
          const uint32_t s = state();
          epsilon(from, s);
          epsilon(emit(*p, s), end);
        }
        return end;
      }
      case ExprNode::kList: {
        const ExprNode& item = *e.parts[0];
        const ExprNode& sep = *e.parts[1];
        if (e.max == 0) return from;
        const uint32_t end = state();
        if (e.min == 0) epsilon(from, end);
        // Items before the last required one are written out; an unbounded tail is one item
        // whose end leads back to its start through the separator (one copy of the item).
        uint32_t cur = from;
        for (int32_t i = 1; i < e.min; ++i) cur = emit(sep, emit(item, cur));
        if (e.max < 0) {
          const uint32_t start = state();
          epsilon(cur, start);
          const uint32_t after = emit(item, start);
          epsilon(emit(sep, after), start);
          epsilon(after, end);
          return end;
        }
        cur = emit(item, cur);
        for (int32_t i = std::max(e.min, 1); i < e.max; ++i) {
          epsilon(cur, end);
          cur = emit(item, emit(sep, cur));
        }
        epsilon(cur, end);
        return end;
      }
      case ExprNode::kMembers: {
        const size_t n = e.parts.size() - 1;
        const ExprNode& sep = *e.parts.back();
        // at[i][w]: before member i, with (w = 1) or without (w = 0) a member written already.
        std::vector<std::array<uint32_t, 2>> at(n + 1);
        at[0][0] = from;
        at[0][1] = state();  // unreachable: nothing was written before member 0
        for (size_t i = 1; i <= n; ++i) at[i] = {state(), state()};
        for (size_t i = 0; i < n; ++i) {
          // Reached as the first member or after a separator; one copy of the member.
          const uint32_t pre = state();
          epsilon(at[i][0], pre);
          epsilon(emit(sep, at[i][1]), pre);
          epsilon(emit(*e.parts[i], pre), at[i + 1][1]);
          if (!e.required[i]) {
            epsilon(at[i][0], at[i + 1][0]);
            epsilon(at[i][1], at[i + 1][1]);
          }
        }
        const uint32_t end = state();
        epsilon(at[n][0], end);
        epsilon(at[n][1], end);
        return end;
      }
      case ExprNode::kUntil: {
        // KMP automaton of the terminator: u[k] = k bytes of it matched.
        const std::string& t = e.text;
        const size_t m = t.size();
        std::vector<size_t> fail(m + 1, 0);
        for (size_t i = 1, k = 0; i < m; ++i) {
          while (k && t[i] != t[k]) k = fail[k];
          if (t[i] == t[k]) ++k;
          fail[i + 1] = k;
        }
        std::vector<uint32_t> u(m + 1);
        for (size_t k = 0; k <= m; ++k) u[k] = state();
        epsilon(from, u[0]);
        for (size_t k = 0; k < m; ++k) {
          // Target of each byte from u[k]; runs of equal targets become one range.
          std::vector<Edge>& out = edges[u[k]];
          for (int c = 0; c < 256; ++c) {
            size_t j = k;
            while (j && uint8_t(t[j]) != c) j = fail[j];
            if (uint8_t(t[j]) == c) ++j;
            if (c > 0 && out.back().to == u[j])
              out.back().hi = uint8_t(c);
            else
              out.push_back({uint8_t(c), uint8_t(c), u[j]});
          }
        }
        return u[m];
      }
    }
    return from;
  }
};

}  // namespace

// The compiled automaton and its lazily built DFA.
struct Grammar::Impl : Nfa {
  uint32_t final_state = 0;    // the NFA's accepting state
  std::vector<uint32_t> seen;  // dstate(): seen[s] == stamp once s is reached
  uint32_t stamp = 0;

  // DFA states: epsilon-closed sets of NFA states, interned, keeping only the states that read
  // a byte or accept. Transitions per byte (-1: dead), filled when a state is first expanded.
  struct DState {
    std::vector<uint32_t> nfa;
    std::vector<int32_t> next;  // [256] once expanded, empty before
    bool accept = false;
    bool terminal = false;  // no byte continues
    int32_t mask = -1;      // index into masks, -1: not computed
  };
  static constexpr size_t kMaxDStates = size_t(1) << 20;
  static constexpr size_t kMaxMasks = 1024;  // 16 KiB each on a 129k vocabulary

  std::mutex mu;
  std::vector<DState> dstates;
  struct VecHash {
    size_t operator()(const std::vector<uint32_t>& v) const {
      uint64_t h = 1469598103934665603ull;
      for (uint32_t x : v) h = (h ^ x) * 1099511628211ull;
      return size_t(h);
    }
  };
  std::unordered_map<std::vector<uint32_t>, int32_t, VecHash> intern;
  std::vector<std::vector<uint64_t>> masks;

  // The DFA state of the NFA states `set` (distinct) and all they reach by epsilon moves.
  int32_t dstate(std::vector<uint32_t> set) {
    ++stamp;
    for (uint32_t s : set) seen[s] = stamp;
    for (size_t w = 0; w < set.size(); ++w)
      for (uint32_t v : eps[set[w]])
        if (seen[v] != stamp) {
          seen[v] = stamp;
          set.push_back(v);
        }
    std::erase_if(set, [this](uint32_t s) { return edges[s].empty() && s != final_state; });
    std::sort(set.begin(), set.end());
    if (set.empty()) return -1;
    auto it = intern.find(set);
    if (it != intern.end()) return it->second;
    if (dstates.size() >= kMaxDStates) return -1;  // beyond the budget: treated as a dead end
    DState d;
    d.accept = std::binary_search(set.begin(), set.end(), final_state);
    d.nfa = set;
    const int32_t id = int32_t(dstates.size());
    dstates.push_back(std::move(d));
    intern.emplace(std::move(set), id);
    return id;
  }

  void expand(int32_t id) {
    if (!dstates[size_t(id)].next.empty()) return;
    // Targets per byte, as sorted sets.
    std::vector<std::vector<uint32_t>> to(256);
    for (uint32_t s : dstates[size_t(id)].nfa)
      for (const Edge& e : edges[s])
        for (int b = e.lo; b <= e.hi; ++b) to[size_t(b)].push_back(e.to);
    std::vector<int32_t> next(256, -1);
    bool any = false;
    for (int b = 0; b < 256; ++b) {
      std::vector<uint32_t>& v = to[size_t(b)];
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      any |= !v.empty();
      next[size_t(b)] = b > 0 && v == to[size_t(b - 1)] ? next[size_t(b - 1)] : dstate(v);
    }
    DState& d = dstates[size_t(id)];
    d.next = std::move(next);
    d.terminal = !any;
  }

  // The tokens allowed at `id` (walk of the vocabulary trie), plus EOS when it accepts.
  const std::vector<uint64_t>& mask(int32_t id, const TokenVocab& vocab) {
    if (dstates[size_t(id)].mask >= 0) return masks[size_t(dstates[size_t(id)].mask)];
    if (masks.size() >= kMaxMasks) {
      masks.clear();
      for (DState& d : dstates) d.mask = -1;
    }
    std::vector<uint64_t> bits(vocab.words(), 0);
    const auto& nodes = vocab.nodes();
    const auto& ids = vocab.sorted_ids();
    // Preorder walk: next[d] is the transition table of the state after the first d bytes of the
    // current path (tables do not move when the state list grows). A dead byte skips the
    // node's subtree.
    std::vector<const int32_t*> next(vocab.max_depth() + 1);
    expand(id);
    next[0] = dstates[size_t(id)].next.data();
    const uint32_t n_nodes = uint32_t(nodes.size());
    for (uint32_t i = 1; i < n_nodes;) {
      const TokenVocab::Node& n = nodes[i];
      const int32_t t = next[n.depth - 1][n.byte];
      if (t < 0) {
        i = n.end;
        continue;
      }
      for (uint32_t k = n.ids_begin; k < n.ids_end; ++k) set_bit(bits, ids[k]);
      if (n.end > i + 1) {
        expand(t);
        next[n.depth] = dstates[size_t(t)].next.data();
      }
      ++i;
    }
    if (dstates[size_t(id)].accept) set_bit(bits, vocab.eos());
    dstates[size_t(id)].mask = int32_t(masks.size());
    masks.push_back(std::move(bits));
    return masks.back();
  }
};

Grammar::Grammar() : impl_(std::make_unique<Impl>()) {}
Grammar::~Grammar() = default;

std::shared_ptr<const Grammar> Grammar::compile(const Expr& e,
                                                std::shared_ptr<const TokenVocab> vocab,
                                                size_t max_states) {
  DI_REQUIRE(vocab, "Grammar::compile needs a vocabulary");
  std::shared_ptr<Grammar> g(new Grammar());
  Impl& im = *g->impl_;
  im.max_states = max_states;
  const uint32_t start = im.state();
  im.final_state = im.emit(*e, start);
  im.seen.assign(im.edges.size(), 0);
  // The start is DFA state 0; a format no output satisfies (a schema of false, a $ref only to
  // itself) has none, and a matcher would have nowhere to begin.
  DI_REQUIRE(im.dstate({start}) == 0, "no output satisfies it (the schema admits no value)");
  g->vocab_ = std::move(vocab);
  return g;
}

size_t Grammar::num_states() const {
  return impl_->edges.size();
}

// --- matcher ---

Matcher::Matcher(std::shared_ptr<const Grammar> g)
    : g_(std::move(g)), state_(0), mask_(g_->vocab().words(), 0) {}

const uint64_t* Matcher::allowed() {
  if (ended_ || state_ < 0) {
    std::fill(mask_.begin(), mask_.end(), 0);
  } else {
    Grammar::Impl& im = *g_->impl_;
    std::lock_guard lk(im.mu);
    const std::vector<uint64_t>& m = im.mask(state_, g_->vocab());
    std::copy(m.begin(), m.end(), mask_.begin());
  }
  if (none_set(mask_)) set_bit(mask_, g_->vocab().eos());
  return mask_.data();
}

bool Matcher::accept(int32_t token) {
  const TokenVocab& vocab = g_->vocab();
  if (token < 0 || token >= vocab.size() || ended_) return false;
  Grammar::Impl& im = *g_->impl_;
  std::lock_guard lk(im.mu);
  if (token == vocab.eos()) {
    // Allowed when complete, and at a dead end (allowed() offers nothing else there).
    const bool ok =
        state_ < 0 || im.dstates[size_t(state_)].accept || none_set(im.mask(state_, vocab));
    if (ok) ended_ = true;
    return ok;
  }
  if (state_ < 0 || vocab.bytes(token).empty()) return false;
  int32_t next = state_;
  for (const char c : vocab.bytes(token)) {
    im.expand(next);
    next = im.dstates[size_t(next)].next[uint8_t(c)];
    if (next < 0) return false;
  }
  state_ = next;
  return true;
}

bool Matcher::complete() const {
  if (ended_) return true;
  if (state_ < 0) return false;
  std::lock_guard lk(g_->impl_->mu);
  return g_->impl_->dstates[size_t(state_)].accept;
}

bool Matcher::finished() const {
  if (ended_ || state_ < 0) return true;
  Grammar::Impl& im = *g_->impl_;
  std::lock_guard lk(im.mu);
  im.expand(state_);
  return im.dstates[size_t(state_)].terminal;
}

}  // namespace deepinfer::grammar

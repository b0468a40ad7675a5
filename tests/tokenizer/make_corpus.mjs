// Writes tests/data/tokenizer/corpus.jsonl: the strings the tokenizer is checked on.
//
//   node tests/tokenizer/make_corpus.mjs
//
// Deterministic (seeded generator). One JSON object per line: {"cat": category, "text": string}
// for valid UTF-8, or {"cat": category, "hex": bytes} for byte strings that are not valid UTF-8.
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "data", "tokenizer", "corpus.jsonl");

// mulberry32: small, fast and reproducible across Node versions.
let seed = 0x5eed1234;
function rand() {
  seed |= 0;
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const repeat = (n, f) => Array.from({ length: n }, f);

const cases = [];
const add = (cat, text) => cases.push({ cat, text });
const addBytes = (cat, bytes) => cases.push({ cat, hex: Buffer.from(bytes).toString("hex") });

// --- English prose ---
const nouns = ("model token engine request server cache layer kernel expert router thread " +
  "window memory batch prompt answer question river mountain city garden window teacher " +
  "student library program function variable pointer network signal market report " +
  "weather season journey castle dragon bicycle kitchen letter morning evening").split(" ");
const verbs = ("runs reads writes computes returns stores loads builds checks sends finds " +
  "keeps moves opens closes follows explains measures compares splits merges").split(" ");
const adjectives = ("quick slow bright quiet large small ancient modern careful sparse dense " +
  "hidden visible strange familiar golden silver empty crowded honest clever").split(" ");
const adverbs = "quickly carefully rarely often silently twice never always again".split(" ");
const names = "Alice Bob Carol Dave Eve Mallory Trent Peggy Victor Walter".split(" ");
function sentence() {
  const subject = rand() < 0.3 ? pick(names) : `The ${pick(adjectives)} ${pick(nouns)}`;
  let s = `${subject} ${pick(verbs)} ${rand() < 0.5 ? "the" : "a"} ${pick(adjectives)} ` +
    `${pick(nouns)}`;
  if (rand() < 0.4) s += ` ${pick(adverbs)}`;
  if (rand() < 0.3) s += `, and ${pick(names)} ${pick(verbs)} it`;
  if (rand() < 0.2) s += ` because it's ${pick(adjectives)}`;
  if (rand() < 0.15) s += ` (don't ask why)`;
  return s + pick([".", ".", ".", "!", "?", "...", ";", ":"]);
}
const prose = [
  "Hello, world!",
  "It's a truth universally acknowledged that tokenizers are harder than they look.",
  "She said, \"We'll see.\" He replied: 'You'd better.'",
  "I can't, won't, shouldn't and mustn't; they've, we're, I'll, he'd.",
  "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
  "the quick brown fox jumps over the lazy dog",
  "e.g. i.e. etc. Mr. Smith vs. Dr. Jones — a.k.a. \"the doctor\".",
  "Email me at someone@example.com or visit https://example.com/path?q=1&r=two#frag",
  "Prices: $5.99, €12, £3.50, ¥1000, 50% off!!! #deal @shop",
  "Well... I suppose -- no, wait -- yes.",
];
for (const p of prose) add("english", p);
for (let i = 0; i < 260; ++i) add("english", repeat(int(1, 5), sentence).join(" "));
for (let i = 0; i < 20; ++i) {
  add("english", repeat(int(2, 4), () => repeat(int(2, 4), sentence).join(" ")).join("\n\n"));
}

// --- Chinese ---
const zhSentences = [
  "今天天气很好，我们去公园散步吧。",
  "机器学习模型需要大量的数据来训练。",
  "他说：“明天见！”然后就走了。",
  "这本书的作者是谁？我想知道更多。",
  "北京是中国的首都，也是一座历史悠久的城市。",
  "请把文件发送到我的邮箱，谢谢！",
  "深度学习在自然语言处理领域取得了巨大进展。",
  "《红楼梦》是中国古典小说的巅峰之作。",
  "价格是１２３元，折扣后只要９９元。",
  "我们在2024年3月15日开会讨论这个问题。",
  "小明和小红是好朋友，他们经常一起学习。",
  "这个算法的时间复杂度是O(n log n)。",
];
const zhChars = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴府团母";
const zhPunct = "，。！？、；：“”《》（）".split("");
for (const s of zhSentences) add("chinese", s);
for (let i = 0; i < 150; ++i) {
  let s = "";
  const n = int(3, 60);
  for (let k = 0; k < n; ++k) s += rand() < 0.12 ? pick(zhPunct) : pick([...zhChars]);
  if (rand() < 0.3) s += ` ${pick(nouns)} ${int(0, 9999)}`;
  add("chinese", s);
}

// --- Japanese ---
const jaSentences = [
  "こんにちは、世界！",
  "私は東京に住んでいます。",
  "今日はとても暑いですね。アイスクリームを食べましょう。",
  "コンピューターのプログラミングは楽しいです。",
  "「ありがとう」と彼女は言った。",
  "日本語の文章には、ひらがな、カタカナ、漢字が混ざっています。",
  "ｶﾀｶﾅの半角文字もあります。",
  "東京タワーは３３３メートルです。",
];
const hira = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞだぢづでどばびぶべぼぱぴぷぺぽゃゅょっー";
const kata = "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンガギグゲゴザジズゼゾダヂヅデドバビブベボパピプペポャュョッー";
for (const s of jaSentences) add("japanese", s);
for (let i = 0; i < 130; ++i) {
  let s = "";
  const n = int(3, 50);
  for (let k = 0; k < n; ++k) {
    const r = rand();
    s += r < 0.45 ? pick([...hira]) : r < 0.75 ? pick([...kata]) : r < 0.95 ? pick([...zhChars])
      : pick(["、", "。", "「", "」", "！", "？", " "]);
  }
  add("japanese", s);
}

// --- Korean ---
const koSentences = [
  "안녕하세요, 세계!",
  "저는 서울에 살고 있습니다.",
  "오늘 날씨가 정말 좋네요. 산책하러 갈까요?",
  "한국어는 한글로 씁니다.",
  "이 모델은 2,048개의 토큰을 처리할 수 있습니다.",
];
const hangul = () => String.fromCodePoint(0xac00 + int(0, 11171));
for (const s of koSentences) add("korean", s);
for (let i = 0; i < 110; ++i) {
  const words = repeat(int(1, 10), () => repeat(int(1, 5), hangul).join(""));
  add("korean", words.join(" ") + pick(["", ".", "?", "!", "요."]));
}

// --- code ---
const idents = "x y i j count total buffer result value key node tree items config".split(" ");
const codeTemplates = [
  () => `def ${pick(idents)}(${pick(idents)}, ${pick(idents)}=None):\n    return ${pick(idents)} + ${int(0, 999)}\n`,
  () => `for ${pick(idents)} in range(${int(1, 100)}):\n\tif ${pick(idents)} % ${int(2, 9)} == 0:\n\t\tprint(f"{${pick(idents)}:>8}")\n`,
  () => `int ${pick(idents)}(const std::vector<float>& ${pick(idents)}) {\n  return static_cast<int>(${pick(idents)}.size()) * ${int(1, 64)};\n}\n`,
  () => `#include <stdio.h>\nint main(void) {\n    printf("%d\\n", ${int(0, 100000)});\n    return 0;\n}\n`,
  () => `const ${pick(idents)} = async (${pick(idents)}) => {\n  await fetch(\`/api/${pick(idents)}/\${${pick(idents)}}\`);\n};\n`,
  () => `fn ${pick(idents)}(${pick(idents)}: &[u8]) -> Result<usize, Error> {\n    Ok(${pick(idents)}.len() << ${int(1, 8)})\n}\n`,
  () => `func ${pick(idents)}(${pick(idents)} int) (int, error) {\n\treturn ${pick(idents)} * ${int(2, 50)}, nil\n}\n`,
  () => `SELECT ${pick(idents)}, COUNT(*) FROM ${pick(idents)} WHERE ${pick(idents)} >= ${int(0, 500)} GROUP BY 1 ORDER BY 2 DESC;`,
  () => `<div class="${pick(idents)}" id="${pick(idents)}-${int(1, 99)}"><span>${sentence()}</span></div>`,
  () => `$ for f in *.txt; do wc -l "$f" | awk '{print $1}' >> out.log; done && echo done`,
  () => `{"${pick(idents)}": ${int(-1000, 1000)}, "${pick(idents)}": [${repeat(int(0, 5), () => int(0, 99)).join(", ")}], "ok": true, "s": "a\\nb"}`,
  () => `    if (${pick(idents)} != nullptr && ${pick(idents)}->${pick(idents)} <= 0x${int(0, 65535).toString(16)}) { ++${pick(idents)}; }`,
  () => `x = [i**2 for i in range(${int(1, 20)}) if i & 1]  # squares of odd numbers`,
  () => `// TODO(${pick(names).toLowerCase()}): handle the ${pick(adjectives)} case\n/* block comment */`,
  () => `a+=b;c-=d;e*=f;g/=h;i%=j;k<<=1;l>>=2;m&&n||o;p!=q;r==s;t<=u;v>=w;x->y;z::w;`,
];
for (let i = 0; i < 260; ++i) add("code", pick(codeTemplates)());
for (let i = 0; i < 30; ++i) add("code", repeat(int(2, 6), () => pick(codeTemplates)()).join("\n"));

// --- emoji and ZWJ sequences ---
const emoji = ["😀", "😂", "🥲", "❤️", "👍", "👍🏽", "👍🏿", "🎉", "🚀", "🐍", "🦀", "🇯🇵", "🇺🇸",
  "🇫🇷", "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏾‍🚀", "🏳️‍🌈", "🏴‍☠️", "1️⃣", "#️⃣", "©️", "™️", "☺️", "✈️", "🤷‍♂️",
  "🧔🏻‍♀️", "🫠", "🪿", "👁️‍🗨️"];
for (const e of emoji) add("emoji", e);
for (let i = 0; i < 120; ++i) {
  const parts = repeat(int(1, 8), () => (rand() < 0.5 ? pick(emoji) : pick([" ", "", pick(nouns),
    pick([...zhChars]), "!", "\n"])));
  add("emoji", parts.join(""));
}

// --- numbers ---
for (let len = 1; len <= 40; ++len) {
  add("numbers", repeat(len, () => String(int(0, 9))).join(""));
  add("numbers", `x${repeat(len, () => String(int(0, 9))).join("")}y`);
  add("numbers", ` ${repeat(len, () => String(int(0, 9))).join("")} `);
}
for (let i = 0; i < 120; ++i) {
  const forms = [
    () => String(int(-100000, 100000)),
    () => (rand() * 10 ** int(0, 8)).toFixed(int(0, 6)),
    () => `${int(1, 9)}.${int(0, 99)}e${pick(["", "-", "+"])}${int(1, 30)}`,
    () => int(0, 10 ** 9).toLocaleString("en-US"),
    () => `${int(0, 255)}.${int(0, 255)}.${int(0, 255)}.${int(0, 255)}`,
    () => `${int(1900, 2100)}-${String(int(1, 12)).padStart(2, "0")}-${String(int(1, 28)).padStart(2, "0")}`,
    () => `+1 (${int(200, 999)}) ${int(200, 999)}-${int(1000, 9999)}`,
    () => `v${int(0, 20)}.${int(0, 99)}.${int(0, 999)}`,
    () => "٠١٢٣٤٥٦٧٨٩".slice(0, int(1, 10)),
    () => "１２３４５６７８９０".slice(0, int(1, 10)),
    () => `x² + y³ = z⁴, ½ + ¼ = ¾, Ⅻ Ⅳ ⅷ, ①②③`,
    () => `${int(0, 99)}%${int(0, 99)}‰ ${int(0, 9)}°C`,
  ];
  add("numbers", pick(forms)());
}

// --- whitespace ---
const spaces = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\u2009",
  "\u202f", "\u2028", "\v", "\f"];
for (let n = 1; n <= 40; ++n) add("whitespace", " ".repeat(n));
for (let n = 1; n <= 12; ++n) add("whitespace", "\t".repeat(n) + "x");
for (let n = 1; n <= 12; ++n) add("whitespace", "a" + "\n".repeat(n) + "b");
for (let i = 0; i < 120; ++i) {
  const parts = repeat(int(1, 10), () => (rand() < 0.6 ? pick(spaces).repeat(int(1, 5))
    : pick([pick(nouns), "x", "。", "!", "1", "é"])));
  add("whitespace", parts.join(""));
}

// --- special-token text ---
const specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
  "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜fim▁hole｜>", "<｜▁pad▁｜>",
  "<think>", "</think>", "<｜place▁holder▁no▁1｜>"];
const nearMisses = ["<｜User", "｜User｜>", "<|User|>", "< ｜User｜>", "<｜user｜>", "<｜Assistant",
  "<｜begin▁of▁sentence", "<｜", "｜>"];
for (const s of specials) add("special", s);
for (const s of nearMisses) add("special", s);
for (let i = 0; i < 100; ++i) {
  const parts = repeat(int(1, 8), () => {
    const r = rand();
    return r < 0.4 ? pick(specials) : r < 0.55 ? pick(nearMisses) : r < 0.8 ? sentence()
      : pick(["", " ", "\n", "x", "你好"]);
  });
  add("special", parts.join(""));
}

// --- accents and other scripts ---
const accented = [
  "café naïve résumé coöperate façade jalapeño piñata",
  "Ærøskøbing Œuvre Straße Ångström Dvořák Łódź Kraków",
  "e\u0301 a\u0300 o\u0308 n\u0303 c\u0327 (combining marks)",
  "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ấ ầ ẩ ẫ ậ",
  "İstanbul ışık IĞDIR ğüşöç",
  "Ελληνικά: ΑΒΓΔ αβγδ ΟΔΥΣΣΕΥΣ ὀδυσσεύς",
  "Русский текст: Съешь же ещё этих мягких французских булок.",
  "العربية: مرحبا بالعالم ١٢٣",
  "עברית: שלום עולם",
  "ภาษาไทย: สวัสดีชาวโลก",
  "हिन्दी: नमस्ते दुनिया",
  "ﬁ ﬂ ﬀ ﬃ ㎏ ㎡ ℃ ℉ Ⓐ ⓐ ﹏ ＡＢＣ ａｂｃ",
  "Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o\u0358",
];
for (const s of accented) add("accents", s);
const accentedLetters = [..."àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿāăąćčďđēĕėęěğģīįıķĺļľłńņňőœŕřśşšţťũūůűųźżžǎǐǒǔ"];
for (let i = 0; i < 110; ++i) {
  const words = repeat(int(1, 8), () => repeat(int(1, 8), () => (rand() < 0.3
    ? pick(accentedLetters) : pick([..."abcdefghijklmnopqrstuvwxyz"]))).join(""));
  let s = words.join(" ");
  if (rand() < 0.3) s = s.toUpperCase();
  if (rand() < 0.3) s = s.normalize("NFD");
  add("accents", s);
}

// --- mixed scripts and symbols from many blocks ---
const blocks = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff],
  [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x2000, 0x206f], [0x2190, 0x21ff],
  [0x2200, 0x22ff], [0x2500, 0x257f], [0x3000, 0x303f], [0xff00, 0xffef], [0x1f300, 0x1f5ff]];
for (let i = 0; i < 180; ++i) {
  let s = "";
  const n = int(1, 40);
  const block = pick(blocks);
  for (let k = 0; k < n; ++k) {
    const b = rand() < 0.7 ? block : pick(blocks);
    const cp = int(b[0], b[1]);
    const str = String.fromCodePoint(cp);
    // Unassigned code points or ones whose properties changed across Unicode versions would
    // test the regex engines' tables, not the tokenizer.
    if (/\p{Cn}|\p{Cs}|\p{Co}/u.test(str) || cp === 0x85 || cp === 0xfeff || cp === 0x180e) {
      continue;
    }
    s += str;
  }
  add("mixed", s);
}

// --- long strings ---
add("long", "a".repeat(3000));
add("long", "ab".repeat(1500));
add("long", " ".repeat(2000) + "x");
add("long", "\n".repeat(500));
add("long", "9".repeat(1001));
add("long", "的".repeat(700));
add("long", "😀".repeat(300));
add("long", repeat(600, () => pick([..."ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"])).join(""));
add("long", "https://example.com/" + repeat(200, () => pick(idents)).join("/"));
add("long", repeat(40, sentence).join(" "));

// --- invalid UTF-8 ---
const utf8 = (s) => [...Buffer.from(s, "utf8")];
const badPieces = [[0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xe0, 0x80, 0x80], [0xed, 0xa0, 0x80],
  [0xf4, 0x90, 0x80, 0x80], [0xf5], [0xfe], [0xff], [0xe4, 0xb8], [0xe4], [0xf0, 0x9f, 0x98],
  [0xf0, 0x9f], [0xc3], [0xc3, 0xc3, 0xa9], [0xe2, 0x82, 0x28], [0xf0, 0x28, 0x8c, 0xbc]];
for (const b of badPieces) addBytes("invalid", b);
for (let i = 0; i < 100; ++i) {
  let bytes = [];
  for (let k = int(1, 6); k > 0; --k) {
    const r = rand();
    if (r < 0.4) bytes = bytes.concat(pick(badPieces));
    else if (r < 0.6) bytes = bytes.concat(utf8(pick(["你好", "é", "😀", "<｜User｜>", " "])));
    else bytes = bytes.concat(utf8(pick(nouns) + pick([" ", "", "\n"])));
  }
  addBytes("invalid", bytes);
}

// --- edge cases ---
for (const s of ["", " ", "\n", "a", "A", "0", "'", "'s", "'S", "''", "\"", "\\", "\u0000",
  "a\u0000b", "\u0001\u0002\u001f\u007f", "Ā", "Ġ", "ĠĠ", "Ċ", "\uFFFD", "\uFFFD\uFFFD",
  "\uFFFF", "\u{10FFFF}", "\u200b", "\u200d", "a\u200db", "\u00ad", "I'll", "it'LL", "don't"]) {
  add("edge", s);
}

const lines = cases.map((c) => JSON.stringify(c)).join("\n") + "\n";
writeFileSync(out, lines);
const counts = {};
for (const c of cases) counts[c.cat] = (counts[c.cat] ?? 0) + 1;
console.log(`${cases.length} strings, ${Buffer.byteLength(lines)} bytes -> ${out}`);
console.log(counts);

"""Real submissions for the judge tests: a+b solutions of every verdict in every language, and hostile ones."""

APLUSB_TESTS = [("1 2\n", "3\n"), ("10 20\n", "30\n"), ("-5 5\n", "0\n")]

PROGRAMS = {
    "python3": {
        "AC": "a, b = map(int, input().split())\nprint(a + b)\n",
        "WA": "a, b = map(int, input().split())\nprint(a - b + 1)\n",
        "TLE": "while True:\n    pass\n",
        "MLE": "x = bytearray(512 * 1024 * 1024)\nprint(len(x))\n",
        "RE": "raise ValueError('boom')\n",
        "CE": "def broken(:\n    pass\n",
        "OLE": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    },
    "c": {
        "AC": "#include <stdio.h>\nint main(void){long a,b;if(scanf(\"%ld %ld\",&a,&b)!=2)return 1;"
              "printf(\"%ld\\n\",a+b);return 0;}\n",
        "WA": "#include <stdio.h>\nint main(void){puts(\"42\");return 0;}\n",
        "TLE": "int main(void){volatile unsigned long x=0;for(;;)x++;}\n",
        "MLE": "#include <stdlib.h>\nint main(void){volatile char*p=malloc(1UL<<29);if(!p)return 3;"
               "for(unsigned long i=0;i<(1UL<<29);i+=4096)p[i]=1;return p[4096]-1;}\n",
        "RE": "int main(void){volatile int*p=0;*p=1;return 0;}\n",
        "CE": "int main(void){ this is not C }\n",
        "OLE": "#include <stdio.h>\nint main(void){for(;;)fputs(\"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\",stdout);}\n",
    },
    "cpp": {
        "AC": "#include <iostream>\nint main(){long long a,b;std::cin>>a>>b;std::cout<<a+b<<\"\\n\";}\n",
        "WA": "#include <iostream>\nint main(){std::cout<<\"-1\\n\";}\n",
        "TLE": "int main(){volatile unsigned long long x=0;for(;;)x++;}\n",
        "MLE": "#include <vector>\n#include <cstdio>\nint main(){std::vector<char> v(1ULL<<29,1);"
               "std::printf(\"%d\\n\",(int)v[12345]);}\n",
        "RE": "#include <stdexcept>\nint main(){throw std::runtime_error(\"boom\");}\n",
        "CE": "#include <iostream>\nint main(){ std::cout << undefined_name; }\n",
        "OLE": "#include <cstdio>\nint main(){for(;;)std::fputs(\"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz\",stdout);}\n",
    },
}

FORK_BOMB_C = "#include <unistd.h>\nint main(void){for(;;)fork();}\n"
FORK_BOMB_PY = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def network_probe_py(port: int) -> str:
    return ("import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "s.sendall(b'escaped')\nprint('connected')\n")


def network_probe_c(port: int) -> str:
    return ("#include <stdio.h>\n#include <string.h>\n#include <unistd.h>\n#include <arpa/inet.h>\n"
            "#include <sys/socket.h>\nint main(void){int s=socket(AF_INET,SOCK_STREAM,0);if(s<0)return 2;"
            "struct sockaddr_in a;memset(&a,0,sizeof a);a.sin_family=AF_INET;"
            f"a.sin_port=htons({port});a.sin_addr.s_addr=htonl(0x7f000001);"
            "if(connect(s,(struct sockaddr*)&a,sizeof a)!=0)return 3;puts(\"connected\");return 0;}\n")


def escape_writer_py(targets: list[str]) -> str:
    return ("import os\nwritten = 0\n"
            f"for path in {targets!r}:\n"
            "    try:\n"
            "        with open(path, 'w') as f:\n"
            "            f.write('escaped')\n"
            "        written += 1\n"
            "    except OSError:\n"
            "        pass\n"
            "print('written' if written else 'contained')\n")
